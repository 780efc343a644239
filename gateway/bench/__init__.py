"""``carpool bench gateway``: what the gateway adds on top of an instant engine."""
