"""Complete, runnable examples: each a TrainModule plus its config in conf/recipe/."""
