"""What the cost model prices on besides the model (``core.model``): hardware (presets and
files), and how much KV memory a deployment leaves (``kv_capacity``)."""
