"""HTML reports: pure figure functions over run records and a self-contained page writer."""
