"""The shipped OpenAPI document tells the truth: real responses match it, for every status."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from unittest import mock

import pytest
from django.contrib.auth.models import Permission
from django.db import OperationalError
from django.test import Client
from django.utils import timezone
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

import approvals
from approvals import gate
from approvals.models import Approval, Rule

DOCUMENT = Path(approvals.__file__).with_name("openapi.json")
PREFIX = "/api/inference"
BASE = "urn:toolgate-openapi"


@pytest.fixture(scope="module")
def document() -> dict:
    return json.loads(DOCUMENT.read_text(encoding="utf-8"))


def pointer(*parts: str) -> str:
    return "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts)


def response_validator(document: dict, path: str, method: str, status: int):
    """A validator for the documented JSON body of one response (inner $refs resolve)."""
    registry = Registry().with_resource(
        BASE, Resource.from_contents(document, default_specification=DRAFT202012)
    )
    where = pointer(
        "paths", path, method, "responses", str(status), "content", "application/json", "schema"
    )
    return Draft202012Validator({"$ref": f"{BASE}#/{where}"}, registry=registry)


def test_the_document_is_valid_openapi_3_1(document):
    assert document["openapi"] == "3.1.0"
    try:
        from schemathesis.specs.openapi.definitions import OPENAPI_31_VALIDATOR
    except ImportError:  # a test dependency's internals moved: the schema checks below remain
        pytest.skip("schemathesis' OpenAPI 3.1 meta-schema is not available")
    OPENAPI_31_VALIDATOR.validate(document)


def test_every_schema_in_the_document_is_valid_json_schema(document):
    for schema in document["components"]["schemas"].values():
        Draft202012Validator.check_schema(schema)


def test_the_document_ships_inside_the_package():
    assert DOCUMENT.is_file()
    assert "approvals/openapi.json" in str(DOCUMENT).replace("\\", "/")


def _scenarios(alice, bob):
    """(documented path, method, status, a callable making the real request)."""
    now = timezone.now()

    def pending(user=alice, **kw):
        kw.setdefault("expires_at", now + timedelta(hours=1))
        return Approval.objects.create(
            approval_id=gate.new_approval_id(),
            session_id="s1",
            user=user,
            tool_name="shell",
            arguments={"cmd": "ls"},
            **kw,
        )

    anonymous, me = Client(), Client()
    me.force_login(alice)
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(alice)

    def confirm(client, body, **extra):
        data = body if isinstance(body, str) else json.dumps(body)
        return client.post(PREFIX + "/tool-confirm", data, content_type="application/json", **extra)

    def decide_twice():
        a = pending()
        confirm(me, {"approval_id": a.approval_id, "decision": "allow"})
        return confirm(me, {"approval_id": a.approval_id, "decision": "deny"})

    def revoke(client, rule_owner):
        rule = Rule.objects.create(user=rule_owner, tool_name="t", decision="allow")
        return client.post(f"{PREFIX}/rules/{rule.pk}/revoke")

    def remembered():
        a = pending()
        body = {"approval_id": a.approval_id, "decision": "allow", "remember": "always"}
        return confirm(me, body)

    def list_rules():
        Rule.objects.create(user=alice, tool_name="x*", decision="deny", arguments_match={"a": "b"})
        Rule.objects.create(
            user=alice, tool_name="y", decision="allow", expires_at=now + timedelta(1)
        )
        return me.get(PREFIX + "/rules")

    def decide(user, decision):
        return confirm(me, {"approval_id": pending(user).approval_id, "decision": decision})

    def database_down():
        a = pending()
        failing = mock.patch(
            "approvals.decisions._update_sql",
            side_effect=OperationalError("database is locked"),
        )
        with failing:
            return confirm(me, {"approval_id": a.approval_id, "decision": "allow"})

    def oversized_revoke():
        url = f"{PREFIX}/rules/1/revoke"
        return me.post(url, "x", content_type="text/plain", CONTENT_LENGTH="99999")

    tc, ta, rl, rv = "/tool-confirm", "/tool-approvals", "/rules", "/rules/{id}/revoke"
    one = "/tool-approvals/{approval_id}"
    return [
        (tc, "post", 200, lambda: decide(alice, "allow")),
        (tc, "post", 200, remembered),
        (tc, "post", 400, lambda: confirm(me, "{")),
        (tc, "post", 400, lambda: confirm(me, {"decision": "allow"})),
        (tc, "post", 400, lambda: confirm(me, {"approval_id": "x", "decision": "perhaps"})),
        (tc, "post", 400, lambda: confirm(me, {"approval_id": "x" * 20000, "decision": "allow"})),
        (tc, "post", 401, lambda: confirm(anonymous, {"approval_id": "x", "decision": "allow"})),
        (tc, "post", 403, lambda: confirm(strict, {"approval_id": "x", "decision": "allow"})),
        (tc, "post", 404, lambda: decide(bob, "deny")),
        (tc, "post", 405, lambda: me.get(PREFIX + tc)),
        (tc, "post", 409, decide_twice),
        (tc, "post", 503, database_down),
        (ta, "get", 200, lambda: (pending(), pending(), me.get(PREFIX + ta))[-1]),
        (ta, "get", 400, lambda: me.get(PREFIX + ta, {"session_id": "s" * 256})),
        (ta, "get", 401, lambda: anonymous.get(PREFIX + ta)),
        (ta, "get", 405, lambda: me.delete(PREFIX + ta)),
        (rl, "get", 200, list_rules),
        (rl, "get", 401, lambda: anonymous.get(PREFIX + rl)),
        (rl, "get", 405, lambda: me.post(PREFIX + rl)),
        (rv, "post", 200, lambda: revoke(me, alice)),
        (rv, "post", 400, oversized_revoke),
        (rv, "post", 401, lambda: revoke(anonymous, alice)),
        (rv, "post", 403, lambda: revoke(strict, alice)),
        (rv, "post", 404, lambda: revoke(me, bob)),
        (rv, "post", 405, lambda: me.get(f"{PREFIX}/rules/1/revoke")),
        (one, "get", 200, lambda: me.get(f"{PREFIX}/tool-approvals/{pending().approval_id}")),
        (one, "get", 401, lambda: anonymous.get(f"{PREFIX}/tool-approvals/x")),
        (one, "get", 404, lambda: me.get(f"{PREFIX}/tool-approvals/{pending(bob).approval_id}")),
        (one, "get", 405, lambda: me.post(f"{PREFIX}/tool-approvals/x")),
        ("/openapi.json", "get", 200, lambda: anonymous.get(PREFIX + "/openapi.json")),
    ]  # fmt: skip


@pytest.mark.django_db
def test_real_responses_match_the_documented_schemas(document, django_user_model):
    alice = django_user_model.objects.create_user("alice")
    bob = django_user_model.objects.create_user("bob")
    bob.user_permissions.add(Permission.objects.get(codename="view_approval"))
    seen = set()
    for path, method, status, make in _scenarios(alice, bob):
        response = make()
        where = f"{method.upper()} {path} -> {status}"
        assert response.status_code == status, (where, response.content[:300])
        documented = document["paths"][path][method]["responses"]
        assert str(status) in documented, where
        assert response["Content-Type"] == "application/json", where
        errors = list(
            response_validator(document, path, method, status).iter_errors(response.json())
        )
        assert not errors, (where, response.json(), [e.message for e in errors])
        allow = documented[str(status)].get("headers", {}).get("Allow")
        if allow:
            assert response["Allow"] == allow["schema"]["const"], where
        seen.add((path, method, str(status)))
    assert _documented(document, agent=False) == seen  # every documented response, no other


def _documented(document: dict, *, agent: bool) -> set:
    return {
        (path, method, status)
        for path, ops in document["paths"].items()
        for method, op in ops.items()
        for status in op["responses"]
        if path.startswith("/approvals") == agent
    }


def _check_response(document, path, method, status, response) -> None:
    where = f"{method.upper()} {path} -> {status}"
    assert response.status_code == status, (where, response.content[:300])
    documented = document["paths"][path][method]["responses"]
    assert str(status) in documented, where
    assert response["Content-Type"] == "application/json", where
    body = response.json()
    found = list(response_validator(document, path, method, status).iter_errors(body))
    assert not found, (where, body, [e.message for e in found])
    allow = documented[str(status)].get("headers", {}).get("Allow")
    if allow:
        assert response["Allow"] == allow["schema"]["const"], where


@pytest.mark.django_db(transaction=True)
def test_agent_api_responses_match_the_documented_schemas(document, django_user_model):
    from .agentapi_scenarios import agent_scenarios

    seen = set()
    for path, method, status, make in agent_scenarios(django_user_model):
        _check_response(document, path, method, status, make())
        seen.add((path, method, str(status)))
    assert _documented(document, agent=True) == seen


def test_the_documented_request_schema_accepts_and_refuses_like_the_endpoint(document):
    schema = document["components"]["schemas"]["DecisionRequest"]
    check = Draft202012Validator(schema)
    assert check.is_valid({"approval_id": "a", "decision": "allow", "remember": "session"})
    assert check.is_valid({"approval_id": "a", "decision": "deny", "reason": None})
    assert not check.is_valid({"approval_id": "a", "decision": "maybe"})
    assert not check.is_valid({"decision": "allow"})
    assert not check.is_valid({"approval_id": "", "decision": "allow"})
    assert not check.is_valid({"approval_id": "a", "decision": "allow", "remember": "forever"})
