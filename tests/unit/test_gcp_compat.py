"""Vertex AI compat: the environment llama-server reads, and its camelCase route aliases."""

from __future__ import annotations

from kvswap.server.gcp import GcpCompat, gcp_alias, post_routes


def test_only_prediction_mode_turns_it_on_with_llama_servers_defaults() -> None:
    assert GcpCompat.from_environ({}) is None
    assert GcpCompat.from_environ({"AIP_MODE": "TRAINING"}) is None
    assert GcpCompat.from_environ({"AIP_MODE": "PREDICTION"}) == GcpCompat(8080, "", "/predict")
    env = {
        "AIP_MODE": "PREDICTION",
        "AIP_HTTP_PORT": "9000",
        "AIP_HEALTH_ROUTE": "ok",
        "AIP_PREDICT_ROUTE": "run",
    }
    assert GcpCompat.from_environ(env) == GcpCompat(9000, "/ok", "/run")


def test_aliases_are_llama_servers_path_to_gcp_format() -> None:
    assert gcp_alias("/v1/chat/completions") == "chatCompletions"
    assert gcp_alias("/chat/completions") == "chatCompletions"
    assert gcp_alias("/apply-template") == "applyTemplate"
    assert gcp_alias("/slots/{id_slot}") == "slots"  # llama-server: /slots/:id_slot
    routes = post_routes(["/chat/completions", "/v1/chat/completions", "/tokenize"])
    assert routes["chatCompletions"] == "/chat/completions"  # the first path wins its alias
    assert routes["/v1/chat/completions"] == "/v1/chat/completions"
    assert routes["tokenize"] == "/tokenize"
