"""Engine processes: the launch plan, ports, start, stops."""
