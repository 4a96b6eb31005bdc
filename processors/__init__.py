"""Stream processors: the faust-streaming app, its agents and tables, and the audit."""
