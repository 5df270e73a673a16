"""The search: the driver loop (ask/tell), the Optuna study on disk, and the planners."""
