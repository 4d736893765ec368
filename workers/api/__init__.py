"""The HTTP API: the app, its routes, request parsing, tokens and the OpenAPI document; it sits on the pools."""
