import subprocess
import sys


def test_import_elastictrain_never_imports_a_framework():
    code = ("import sys, elastictrain as et, elastictrain.runtime.shards, elastictrain.coordinator.app, "
            "elastictrain.launcher.agent, elastictrain.cli\n"
            "et.init; et.DatasetSpec; et.ShardIterator\n"
            "bad = [m for m in ('torch', 'tensorflow') if m in sys.modules]\n"
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_public_api_is_small_and_resolves():
    import elastictrain as et

    assert len(et.__all__) <= 25
    for name in et.__all__:
        assert getattr(et, name) is not None
