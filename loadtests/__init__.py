"""Load tests: the Locust file, the headless runner, the report and a local server."""
