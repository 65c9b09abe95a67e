"""The serving core that the simulator and the real engine both drive: request state, KV block
allocators, the scheduler and its policies, and their configuration. Standard library only; it
imports nothing else of ours."""
