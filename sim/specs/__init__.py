"""What the cost model prices on: hardware (presets and files), the model shapes the simulator
reads, and how much KV memory a deployment leaves (``kv_capacity``)."""
