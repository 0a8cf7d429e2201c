"""`hydra/sweeper=swinexp_optuna`: swinexp's Optuna sweeper (found by Hydra's plugin scan of `hydra_plugins`)."""
