"""The tiny variant of every study (a fraction of a second per point on loopback) and the legs
each stores: shared by the loopback, SSH, SPDK and kernel-stack runs of the studies."""



def head(repeats: int = 1) -> str:
    """The spec's top: repeats, 0.3 s points without ramp, target on core 0 and load on core 1, a
    16 MiB RAM namespace (the other tests' tiny real runs start from it too)."""
    return f"""
repeats = {repeats}
ramp_time = 0
runtime = 0.3
[topology]
target_cores = [0]
host_cores = [1]
[backend]
kind = "ram"
size = "16MiB"
"""


HEAD = head()
SPECS = {
    "contention": 'study = "contention"\n' + HEAD
                  + '[params]\napps = ["L-app"]\nflows = [1]\nplacements = ["same"]\nflow_slack_s = 0.5\n'
                    'storage_apps = [2]\ngrid_lapps = []\n',
    "dimensions": 'study = "dimensions"\n' + HEAD
                  + '[params]\npatterns = ["randread"]\nbs = ["4k"]\niodepth = 4\ncores = [1]\n'
                    'concurrency_iodepth = [4]\n',
    # two target cores: placement runs two load generators (roles main and lg1)
    "busy-poll": 'study = "busy-poll"\n' + HEAD + '[params]\ntarget_cores = [2]\nconns_per_core = 1\niodepth = 4\n',
    "polling": 'study = "polling"\n' + HEAD
               + '[params]\niodepth = [1]\nidle_poll_us = [0]\nhigh_iodepth = 2\nio_queues = []\n',
    "overhead": 'study = "overhead"\n' + HEAD
                + '[params]\niodepth = [1]\nbs = ["4k"]\nbapp_iodepth = [1]\nlegs = ["local", "loopback"]\n',
    "saturation": 'study = "saturation"\n' + HEAD
                  + '[params]\nnumjobs = [1]\niodepth = [1, 2]\ntarget_core_counts = []\n',
    "stacks": 'study = "stacks"\n' + HEAD.replace("runtime = 0.3", "runtime = 1")
              + '[params]\ntargets = ["ours"]\nhosts = ["ours"]\nbaseline = "ours/ours"\niodepth = [1]\n'
                'bapp_iodepth = 1\n',
    "parallelism": 'study = "parallelism"\n' + HEAD.replace('"ram"', '"file"')
                   + '[params]\nnumjobs = [1]\nnumjobs_iodepth = 2\nbs = ["4k"]\nsize_iodepth = 2\niodepth = [1]\n',
}
LEGS = {
    "polling": {"completion", "idle_poll", "matrix"},
    "overhead": {"local", "loopback"},
    "saturation": None,  # depends on the machine's cores: checked below
    "stacks": {"ours/ours"},
    "contention": {"isolated", "same_core", "many_apps"},
    "dimensions": {"pattern", "cores", "local", "concurrency"},
    "busy-poll": {"off", "on", "busy_only", "placement_only"},  # factors = true by default
    "parallelism": {"numjobs", "size_local", "size_remote", "depth_local", "depth_remote"},
}
