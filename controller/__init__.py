"""The per-node agent: launches a node's ranks, sees their exits, executes verified commands.

Modules, from the decision outwards:

* `controller.command_gate`: the pure decision on a restart command (verify, own, not replayed);
* `controller.elastic`, `controller.membership`: culprits, failure budgets, the next world
  size and the next incarnation's nodes (pure);
* `controller.restart_plan`: what a verified command does, before and after the stop (pure);
* `controller.state`: the run's state directory (launch spec and gang record, processed
  commands, lock; `controller.record_v1` reads the format before the split);
* `controller.launcher`: the `Launcher` seam (start, adopt, watch, stop a run's processes
  on this node) and `LocalLauncher` over `controller.gang` and `controller.spares`;
* `controller.supervisor`: one run's gang under the controller (observe, execute the plans);
* `controller.logwatch`: a printing script's events, from rank 0's output;
* `controller.loop`: the Kafka I/O loop over all of the above.

It lived under ``sinks/`` in version one; it may import `common`, `schemas` and `producers`
(the emitter that announces RunEnded, the log-line parsers), never `runwatch`.
"""
