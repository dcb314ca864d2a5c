"""Launcher detection from environment variables (no processes started)."""

from trainer.runtime.launch import detect_environment, expand_slurm_nodelist, strip_local_rank_argument


def test_plain_run_has_no_launcher():
    env = detect_environment({})
    assert (env.launcher, env.rank, env.world_size, env.external) == ("none", 0, 1, False)


def test_torchrun_variables():
    env = detect_environment(
        {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
         "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400"}
    )
    assert (env.launcher, env.rank, env.local_rank, env.world_size, env.node_rank) == ("torchrun", 3, 1, 4, 1)
    assert (env.master_addr, env.master_port, env.external) == ("10.0.0.1", 29400, True)


def test_legacy_launcher_without_local_rank_variable_derives_it():
    # torch.distributed.launch / deepspeed pass --local_rank as an argument instead.
    env = detect_environment({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"})
    assert (env.local_rank, env.node_rank) == (1, 1)


def test_slurm_variables():
    env = detect_environment(
        {"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8", "SLURM_NNODES": "2", "SLURM_NODEID": "1",
         "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "4242"}
    )
    assert (env.launcher, env.rank, env.local_rank, env.world_size, env.local_world_size) == ("slurm", 5, 1, 8, 4)
    assert env.master_addr == "gpu07" and env.master_port == 15000 + 4242


def test_single_slurm_task_spawns_instead():
    assert detect_environment({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}).launcher == "none"


def test_nodelist_expansion():
    assert expand_slurm_nodelist("node[01-03,07],gpu5") == ["node01", "node02", "node03", "node07", "gpu5"]
    assert expand_slurm_nodelist("a1") == ["a1"]


def test_local_rank_argument_is_removed_and_exported(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")  # records "unset", so the export below is undone after the test
    monkeypatch.delenv("LOCAL_RANK")
    assert strip_local_rank_argument(["train.py", "--local-rank=1", "strategy=ddp"]) == ["train.py", "strategy=ddp"]
    import os

    assert os.environ["LOCAL_RANK"] == "1"
    assert strip_local_rank_argument(["train.py", "--local_rank", "0", "x=1"]) == ["train.py", "x=1"]


def test_submitit_local_tasks_are_ranks():
    # hydra/launcher=submitit_local with tasks_per_node=2: each task has submitit's variables, no SLURM ones.
    env = detect_environment({"SUBMITIT_LOCAL_GLOBALID": "1", "SUBMITIT_LOCAL_LOCALID": "1", "SUBMITIT_LOCAL_NTASKS": "2",
                              "SUBMITIT_LOCAL_JOB_ID": "4321", "SUBMITIT_EXECUTOR": "local"})
    assert (env.launcher, env.rank, env.local_rank, env.world_size, env.local_world_size) == ("submitit", 1, 1, 2, 2)
    assert env.external and env.distributed and (env.master_addr, env.master_port) == ("127.0.0.1", 15000 + 4321)
    # One task: the trainer spawns its ranks itself, as without a launcher.
    assert detect_environment({"SUBMITIT_LOCAL_GLOBALID": "0", "SUBMITIT_LOCAL_NTASKS": "1"}).launcher == "none"
