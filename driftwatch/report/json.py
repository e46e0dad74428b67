"""``driftwatch report --json``: the report as one JSON document."""

from __future__ import annotations

import json

from driftwatch.report.model import Report


def to_json(report: Report) -> str:
    """One JSON document: the run, a summary of each series, the findings, the captures."""
    run = report.run
    document = {
        "db": report.db,
        "run": {
            "id": run.id,
            "name": run.name,
            "host": run.host,
            "pid": run.pid,
            "create_time": run.create_time,
            "command": run.command,
            "user": run.user,
            "meta": run.meta,
            "first_seen": run.first_seen,
            "last_seen": run.last_seen,
            "ended": run.ended,
        },
        "trends": [
            {
                "panel": panel.title,
                "line": line.label,
                "per_hour": line.trend.slope * 3600,
                "note": line.note,
            }
            for panel in report.panels
            for line in panel.lines
            if line.trend is not None
        ],
        "goodput": None if report.goodput is None else report.goodput.to_dict(),
        "series": [s.to_dict() for s in report.series],
        "findings": [
            {
                "kind": f.kind,
                "severity": f.severity.value,
                "since": f.since,
                "first_seen": f.first_seen,
                "last_seen": f.last_seen,
                "message": f.message,
                "evidence": f.evidence,
                "changes": [
                    {"t": t, "severity": s.value if s is not None else None} for t, s in f.changes
                ],
            }
            for f in report.findings
        ],
        "captures": [c.to_dict() for c in report.captures],
        "capture_logdir": report.capture_logdir,
    }
    return json.dumps(document, indent=2, sort_keys=True)
