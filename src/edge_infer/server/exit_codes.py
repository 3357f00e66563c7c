"""How `edge-infer serve` ends, as its exit status (what a supervisor such as systemd sees)."""
EXIT_OK = 0  # drained after SIGTERM / Ctrl-C
EXIT_LOAD_FAILED = 1  # the model did not come up (or the plan refused it)
EXIT_ENGINE_DEAD = 3  # the engine worker died and was not (or no longer) restarted
