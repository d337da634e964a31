"""beamserve's service: HTTP API, batching engine, metrics, Ray Serve deployment."""
