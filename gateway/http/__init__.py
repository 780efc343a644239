"""The HTTP edge of a gateway process: app, auth, admin, relay of outputs to clients, cancellation."""
