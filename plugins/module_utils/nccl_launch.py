# Copyright: stethoscope developers
# Apache License 2.0
"""How an nccl-tests run is launched: one rank per GPU on one node (nccl-tests' own -g), or one
process per GPU on one or several nodes through mpirun or srun. Pure: argv lists, never a shell line."""

from __future__ import annotations

LAUNCHERS = ("none", "mpirun", "srun")


class LaunchRefused(Exception):
    """The run asked for cannot measure a bus: it names why."""


def topology(node_count, gpus_per_node):
    """The label that keeps unlike runs apart: nodes x GPUs per node."""
    return "%dx%d" % (node_count, gpus_per_node)


def hostfile_text(hosts, gpus_per_node):
    """Open MPI's hostfile: one line per node, a slot per GPU."""
    return "".join("%s slots=%d\n" % (host, gpus_per_node) for host in hosts)


def _check(launcher, binary, args, gpus_per_node, hosts):
    if launcher not in LAUNCHERS:
        raise LaunchRefused("launcher %r is not one of %s" % (launcher, ", ".join(LAUNCHERS)))
    if "-g" in args or "--ngpus" in args:
        raise LaunchRefused(
            "%s args carry -g: the rank count comes from gpus_per_node (one rank per GPU)" % binary
        )
    if launcher != "none" and not hosts:
        raise LaunchRefused("%s through %s needs the nodes to run on (hosts)" % (binary, launcher))
    if launcher == "none" and len(hosts) > 1:
        raise LaunchRefused(
            "%s over %d nodes needs a launcher (mpirun or srun), not none" % (binary, len(hosts))
        )
    ranks = gpus_per_node * max(len(hosts), 1)
    if ranks < 2:
        raise LaunchRefused(
            "%s with %d rank (%s): an all-reduce of one rank moves nothing (bus bandwidth 2(n-1)/n = 0);"
            " refused, never a baseline" % (binary, ranks, topology(max(len(hosts), 1), gpus_per_node))
        )
    return ranks


def plan(launcher, binary, args, gpus_per_node, hosts=(), launcher_args=(), hostfile=None):
    """-> {"argv", "ranks", "nodes", "gpus_per_node", "topology"}; LaunchRefused for a run of one rank,
    several nodes without a launcher, or args that set the GPU count themselves.

    mpirun and srun start one process per GPU (-g 1 each) and pass NCCL_ALGO on to every rank."""
    args, hosts, launcher_args = list(args), list(hosts), list(launcher_args)
    ranks = _check(launcher, binary, args, gpus_per_node, hosts)
    nodes = max(len(hosts), 1)
    if launcher == "none":
        argv = [binary, *args, "-g", str(gpus_per_node)]
    elif launcher == "mpirun":
        if not hostfile:
            raise LaunchRefused("mpirun needs a hostfile")
        argv = [
            "mpirun",
            "--hostfile",
            hostfile,
            "-np",
            str(ranks),
            "--map-by",
            "ppr:%d:node" % gpus_per_node,
            "--tag-output",
            "-x",
            "NCCL_ALGO",
            *launcher_args,
            binary,
            *args,
            "-g",
            "1",
        ]
    else:
        argv = [
            "srun",
            "--nodelist",
            ",".join(hosts),
            "--nodes",
            str(nodes),
            "--ntasks-per-node",
            str(gpus_per_node),
            "--label",
            *launcher_args,
            binary,
            *args,
            "-g",
            "1",
        ]
    return {
        "argv": argv,
        "launcher": launcher,
        "ranks": ranks,
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "topology": topology(nodes, gpus_per_node),
    }
