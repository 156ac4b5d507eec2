"""Serving a trained run over HTTP: requests batched across clients (batcher), the engine
that translates them (engine), the endpoints (api) and their counters (metrics)."""
