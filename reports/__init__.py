"""HTML reports: pure figure functions over run records and a self-contained page writer."""

from reports.html import render_report, write_report
from reports.records import RunRecords, load_run, records_from_result

__all__ = ["RunRecords", "load_run", "records_from_result", "render_report", "write_report"]
