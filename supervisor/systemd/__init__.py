"""systemd integration: unit files, D-Bus control and sd_notify."""
