"""The OpenAI-compatible API: routes, request schema, response and stream format."""
