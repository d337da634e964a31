"""The Serve config in deploy/ is valid for Ray and its import_path builds the real application."""

import importlib

import pytest
import yaml

from service.batching import BatchingConfig

from .conftest import REPO


def test_serve_config_validates_and_its_import_path_builds_the_app() -> None:
    from ray.serve.schema import ServeDeploySchema

    config = yaml.safe_load((REPO / "deploy" / "serve_config.yaml").read_text())
    app = ServeDeploySchema.model_validate(config).applications[0]
    module, attr = app.import_path.split(":")
    built = getattr(importlib.import_module(module), attr)(app.args)
    gateway = built._bound_deployment
    pairs = gateway.init_args[0]
    built_names = {gateway.name} | {p._bound_deployment.name for p in pairs.values()}
    assert {d.name for d in app.deployments} == built_names == {"Gateway", "model-en-de", "model-en-fr"}
    for d in app.deployments:
        if d.name.startswith("model-"):
            assert set(d.user_config) == set(BatchingConfig.__dataclass_fields__)


def test_settings_offer_every_batching_knob_with_its_default_or_the_device_s() -> None:
    import dataclasses

    from service.batching import GPU_SIZES
    from service.settings import Settings

    fields = Settings.model_fields
    for f in dataclasses.fields(BatchingConfig):
        assert f.name in fields, f.name
        expected = None if f.name in GPU_SIZES else f.default  # sizes: the replica's device decides
        assert fields[f.name].default == expected, f.name


def test_gpu_replicas_share_the_gpus_ray_has() -> None:
    from service.app import gpu_share

    assert gpu_share(1, 1) == gpu_share(2, 4) == 1.0  # enough GPUs: a whole one each
    assert gpu_share(3, 1) == pytest.approx(1 / 3)
    assert gpu_share(3, 2) == gpu_share(4, 2) == 0.5  # a fraction Ray can place: two to a GPU
    assert gpu_share(5, 2) == pytest.approx(1 / 3)
    assert gpu_share(3, 0) == gpu_share(0, 1) == 0.0


def test_a_replica_asks_for_its_gpu_share_unless_its_device_or_its_setting_says_otherwise() -> None:
    from service.app import actor_options
    from service.settings import Settings

    assert actor_options(Settings(), 0.5)["num_gpus"] == 0.5
    assert actor_options(Settings(device="cpu"), 0.5)["num_gpus"] == 0.0
    assert actor_options(Settings(replica_gpus=0.25), 0.5)["num_gpus"] == 0.25


def test_the_static_decode_state_is_the_gpu_s_default_and_a_setting_overrides_it() -> None:
    from service.settings import Settings

    assert Settings().uses_static_slots("cuda") and not Settings().uses_static_slots("cpu")
    assert not Settings(static_slots=False).uses_static_slots("cuda")
    assert Settings(static_slots=True).uses_static_slots("cpu")


def test_one_model_is_held_by_the_ingress_and_several_get_deployments_of_their_own() -> None:
    from service.app import build_app
    from service.settings import Settings

    def deployments(**args: object) -> tuple[dict[str, object], list[str], list[str]]:
        gateway = build_app(args)._bound_deployment
        pairs, _, _, held = gateway.init_args
        return gateway.ray_actor_options, sorted(p._bound_deployment.name for p in pairs.values()), held

    options, handles, held = deployments(models="en-de", replica_cpus=1.5)
    assert handles == [] and [e["name"] for e in held] == ["en-de"]
    assert options["num_cpus"] == 1.5  # the model's CPUs, asked by the ingress that holds it
    options, handles, held = deployments(models="en-de", colocate=False)
    assert handles == ["model-en-de"] and held == [] and options["num_cpus"] == 0
    assert deployments(models="en-de,en-fr")[1:] == (["model-en-de", "model-en-fr"], [])
    options, handles, held = deployments(models="en-de,en-fr", colocate=True, replica_cpus=1.0)
    assert handles == [] and len(held) == 2 and options["num_cpus"] == 2.0
    entries = Settings(models="en-de").entries()
    assert Settings().uses_colocation(entries) and not Settings(colocate=False).uses_colocation(entries)
