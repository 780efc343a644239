"""`carpool loadtest`: start a server, run Locust headless against it, report per tier."""
