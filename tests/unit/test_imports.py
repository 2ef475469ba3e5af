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


def test_engines_import_ray_and_kubernetes_only_when_used():
    code = ("import sys, elastictrain.cli, elastictrain.coordinator.server, elastictrain.engines.ray_engine, "
            "elastictrain.engines.ray_task, elastictrain.engines.kubernetes_engine, elastictrain.engines.k8s_manifests, "
            "elastictrain.cluster_cli\n"
            "bad = [m for m in ('ray', 'kubernetes') if m in sys.modules]\n"
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)
