"""The ``carpool`` command and its subcommands."""
