"""HTML reports: pure figure functions over run records and a self-contained page writer."""

from records.run_dir import RunRecords, load_run, records_from_result
from reports.html import render_report, write_report

__all__ = ["RunRecords", "load_run", "records_from_result", "render_report", "write_report"]
