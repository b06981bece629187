"""report.html, the visual clustering report written into `--dump_to` (see `page.py`).

TF-free: `tfxla_lite.dump` hands it plain records; `layout.py` places DAG nodes in
layers, `svg.py` draws graphs and buffer timelines, `page.py` assembles the page.
"""

from __future__ import annotations

from tfxla_lite.report_html.page import (
    ClusterRecord,
    GraphNodeRecord,
    TraceRecord,
    render_page,
)

__all__ = ["ClusterRecord", "GraphNodeRecord", "TraceRecord", "render_page"]
