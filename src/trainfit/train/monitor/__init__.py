"""Watching a training while it runs: the machine, the speed, memory leaks, and the safety
policies that act on what is seen.

live.py              Monitor: machine samples in a thread, step times, ETA (metrics.jsonl)
leaks.py             the memory-leak fit (LeakDetector, LeakFinding)
callback.py          the three ways in: MonitorCallback, monitor_training, build_monitor
dashboard.py         the live terminal panel drawn from a Monitor
units.py             byte units and the text of sizes and durations
events.py            the records of metrics.jsonl (append_record, event), which every writer uses
safety.py            safety_callbacks: the policies of one run
safety_context.py    what the policies share (SafetyContext, TrainingStopped)
machine_policies.py  thermal, power and memory-pressure policies
run_policies.py      checkpoint cadence, clean stop on signals, NonFiniteGuard

Nothing here imports recovery/ (which writes its events through events.py): what the policies
ask of it, a smaller step under memory pressure and the newest checkpoint of a stopped run, the
runner hands to safety_callbacks.
"""
