"""Train a recipe: ``python train.py [recipe=gpt] [strategy=ddp trainer.devices=2] [key=value ...]``.

The config is composed and resolved once, here; see trainer/cli/hydra_app.py for how workers get it.
"""

import hydra

from trainer.cli.hydra_app import main, run_job


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def hydra_task(cfg):
    return run_job(cfg)


if __name__ == "__main__":
    main(hydra_task)
