"""launcher: systemd: target units written and controlled over D-Bus, re-adopted after a daemon restart."""
