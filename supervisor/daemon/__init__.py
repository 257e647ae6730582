"""The daemon: lifecycle and signals, the fleet of target supervisors and reload, the
status file, logging and sd_notify."""
