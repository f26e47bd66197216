"""composer.xla_flags: the project's XLA flags join XLA_FLAGS without overriding the user's."""

from composer import xla_flags


def test_apply_adds_missing_flags_and_keeps_others():
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    flags = xla_flags.apply(env)
    assert env["XLA_FLAGS"] == flags
    assert flags.startswith("--xla_force_host_platform_device_count=8 ")
    for name, value in xla_flags.CPU_FLAGS.items():
        assert f"--{name}={value}" in flags.split()


def test_apply_leaves_a_flag_the_user_set():
    name = next(iter(xla_flags.CPU_FLAGS))
    env = {"XLA_FLAGS": f"--{name}=dot"}
    assert xla_flags.apply(env).split().count(f"--{name}=dot") == 1
    assert sum(f.startswith(f"--{name}=") for f in env["XLA_FLAGS"].split()) == 1


def test_apply_with_no_xla_flags_set():
    env = {}
    xla_flags.apply(env)
    assert env["XLA_FLAGS"] == " ".join(f"--{k}={v}" for k, v in xla_flags.CPU_FLAGS.items())
