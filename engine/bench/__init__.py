"""Engine benchmarks: ``carpool bench engine`` and the scheduler benchmark."""
