"""The command line and what its commands run: watch sessions, launching a job, the demo,
`doctor`, the shipped rules and dashboards, offline analysis."""
