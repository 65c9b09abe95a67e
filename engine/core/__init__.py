"""Shared serving core: request state, KV block allocators, scheduler, policies (stdlib only)."""
