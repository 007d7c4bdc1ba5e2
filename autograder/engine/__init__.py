"""The machinery checks and demos share: fresh processes, crash trials, process groups and PID
namespaces, the file-operation recorder, the rank server and launchers, portable functions."""
