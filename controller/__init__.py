"""The per-node agent: launches a node's ranks, sees their exits, executes restart commands."""
