"""The model description both executors build from: a Hugging Face ``config.json`` reader
(standard library only) and the shapes it yields."""
