"""The one model description both executors build from (`spec.ModelSpec`), its Hugging Face
``config.json`` reader (`hf_config`) and the named presets (`presets`). Standard library only."""
