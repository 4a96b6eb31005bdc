"""The per-node agent: launches a node's ranks, sees their exits, executes verified commands.

Modules, from the decision outwards:

* `controller.command_gate`: the pure decision on a restart command (verify, own, not replayed);
* `controller.elastic`: culprits, failure budgets and the next world size (pure);
* `controller.state`: the run's state directory (gang record, processed commands, lock);
* `controller.gang`: launching, adopting, watching and stopping a gang's processes;
* `controller.supervisor`: one run's gang under the controller (launch, observe, restart);
* `controller.logwatch`: a printing script's events, from rank 0's output;
* `controller.loop`: the Kafka I/O loop over all of the above.

It lived under ``sinks/`` in version one; it may import `common`, `schemas` and `producers`
(the emitter that announces RunEnded, the log-line parsers), never `runwatch`.
"""
