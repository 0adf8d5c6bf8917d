"""Who may read the metrics: what the task list asks (view_keyedtask), a bearer token as Prometheus sends it
(``KEYED_QUEUE_METRICS_TOKEN``, compared in constant time), or anyone with ``KEYED_QUEUE_METRICS_PUBLIC``;
any Authorization header gets an answer, never a 500."""

import hmac

import pytest
from django.contrib.auth.models import Permission, User
from django.test import override_settings
from django.urls import reverse
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from django_keyed_queue.ops.console import metrics as metrics_view

pytestmark = pytest.mark.django_db
URL = "/keyed-queue/metrics/"
TOKEN = "kq-3f9c1b7e0d2a4c6e8f1a3b5c7d9e0f2a"
WITH_TOKEN = override_settings(KEYED_QUEUE_METRICS_TOKEN=TOKEN)


def staff(name: str, *codenames: str, superuser: bool = False) -> User:
    """A staff user with only the given permissions of ours (none at all for a plain staff user)."""
    user = User.objects.create_user(name, password="pw", is_staff=True, is_superuser=superuser)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="keyed_queue", codename__in=codenames))
    return user


@pytest.mark.parametrize(
    ("user", "status"),
    [
        (lambda: staff("plain"), 403),
        (lambda: staff("may-cancel", "cancel_keyedtask", "pause_key"), 403),
        (lambda: staff("viewer", "view_keyedtask"), 200),
        (lambda: staff("changer", "change_keyedtask"), 200),  # Django's view permission: it implies view
        (lambda: staff("root", superuser=True), 200),
    ],
    ids=["staff", "staff-with-actions-only", "view_keyedtask", "change_keyedtask", "superuser"],
)
def test_a_staff_user_reads_the_metrics_exactly_when_the_task_list_lets_them_in(client, gate_redis, user, status):
    client.force_login(user())
    answer = client.get(URL)
    assert answer.status_code == status, answer.content
    task_list = client.get(reverse("admin:keyed_queue_keyedtask_changelist"))
    assert task_list.status_code == status, "the metrics ask what the task list asks"
    if status == 403:
        assert b"You may not view keyed tasks" in answer.content and b"keyed_queue_" not in answer.content


def test_without_a_token_anyone_else_is_sent_to_the_admin_s_login_as_before(client, gate_redis):
    assert client.get(URL).status_code == 302
    assert client.get(URL)["Location"].startswith("/admin/login/")
    assert client.get(URL, HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 302, "no token set: none is let in"
    client.force_login(User.objects.create_user("customer", password="pw"))  # logged in, not staff
    assert client.get(URL).status_code == 302
    for empty in ("", "  "):  # an empty setting (a check reports it) lets no empty Bearer in
        with override_settings(KEYED_QUEUE_METRICS_TOKEN=empty):
            assert client.get(URL, HTTP_AUTHORIZATION="Bearer ").status_code == 302


def test_the_right_token_reads_the_metrics_without_a_session(client, gate_redis):
    with WITH_TOKEN:
        for header in (f"Bearer {TOKEN}", f"bearer {TOKEN}", f"  Bearer   {TOKEN} "):
            answer = client.get(URL, HTTP_AUTHORIZATION=header)
            assert answer.status_code == 200, header
            assert answer["Content-Type"].startswith("text/plain") and b"keyed_queue_gate_up 1.0" in answer.content
    assert "_auth_user_id" not in client.session


def test_a_wrong_or_missing_token_gets_401_asking_for_one_not_a_login_page(client, gate_redis):
    with WITH_TOKEN:
        missing = client.get(URL)
        assert missing.status_code == 401
        assert missing["WWW-Authenticate"] == 'Bearer realm="keyed_queue metrics"'
        for wrong in (TOKEN[:-1], TOKEN + "0", TOKEN.upper(), "", "x" * 5000, f"{TOKEN} {TOKEN}"):
            answer = client.get(URL, HTTP_AUTHORIZATION=f"Bearer {wrong}")
            assert answer.status_code == 401, wrong
            assert answer["WWW-Authenticate"] == 'Bearer realm="keyed_queue metrics", error="invalid_token"'
            assert TOKEN.encode() not in answer.content and TOKEN not in str(answer.headers)
        for other in (f"Basic {TOKEN}", TOKEN, f"Token {TOKEN}"):  # not a bearer token: as if none was sent
            assert client.get(URL, HTTP_AUTHORIZATION=other)["WWW-Authenticate"] == 'Bearer realm="keyed_queue metrics"'

        client.force_login(User.objects.create_user("customer", password="pw"))  # logged in, not staff
        assert client.get(URL).status_code == 401
        client.force_login(staff("plain"))  # staff without the permission: told so, whatever the token
        assert client.get(URL).status_code == 403
        assert client.get(URL, HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
        assert client.get(URL, HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 200


def test_a_user_who_may_view_keyed_tasks_needs_no_token(viewer_client, gate_redis):
    with WITH_TOKEN:
        assert viewer_client.get(URL).status_code == 200
        assert viewer_client.get(URL, HTTP_AUTHORIZATION="Bearer wrong").status_code == 200  # a proxy's own token


def test_public_metrics_answer_anyone(client, gate_redis):
    with override_settings(KEYED_QUEUE_METRICS_PUBLIC=True):
        assert client.get(URL).status_code == 200
        with WITH_TOKEN:
            assert client.get(URL).status_code == 200
            assert client.get(URL, HTTP_AUTHORIZATION="Bearer wrong").status_code == 200
        client.force_login(staff("plain"))
        assert client.get(URL).status_code == 200


def test_the_token_is_compared_in_constant_time_on_digests_of_one_length(client, gate_redis, monkeypatch):
    compared: list[tuple[bytes, bytes, bool]] = []

    def recording(a, b):
        same = hmac.compare_digest(a, b)
        compared.append((a, b, same))
        return same

    monkeypatch.setattr(metrics_view, "compare_digest", recording)
    with WITH_TOKEN:
        offered = ["w", TOKEN[:-1], TOKEN + "0" * 1000, TOKEN, "é" * 3, "€"]
        statuses = [client.get(URL, HTTP_AUTHORIZATION=f"Bearer {o}").status_code for o in offered]
    assert statuses == [401, 401, 401, 200, 401, 401]
    assert [same for _, _, same in compared] == [False, False, False, True, False, False]
    assert {(type(a), len(a), type(b), len(b)) for a, b, _ in compared} == {(bytes, 32, bytes, 32)}
    assert len({b for _, b, _ in compared}) == 1, "the token's side is the same bytes every time"


#: Authorization headers no server refuses and a test client passes as they are.
headers = (
    st.text(max_size=300)
    | st.text(max_size=300).map(lambda text: f"Bearer {text}")
    | st.binary(max_size=300).map(lambda raw: "Bearer " + raw.decode("latin-1"))  # bytes as a WSGI server has them
    | st.sampled_from(
        [
            "\x00",
            "Bearer \x00",
            f"Bearer {TOKEN}\x00",
            f"Bearer \x00{TOKEN}",
            "Bearer " + "x" * 1_000_000,
            "Bearer " + "\U0001f511" * 10_000,
            "Bearer \ud800",  # a lone surrogate: no codec encodes it strictly
            f"Bearer {TOKEN}\n",
            f"Bearer\t{TOKEN}",
            "Bearer",
            "Bearer ",
            " ",
        ]
    )
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(header=headers)
@example(header=f"Bearer {TOKEN}")
def test_any_authorization_header_gets_an_answer_never_a_500(client, gate_redis, header):
    right = header.strip().partition(" ")[0].lower() == "bearer" and header.strip().partition(" ")[2].strip() == TOKEN
    with WITH_TOKEN:
        answer = client.get(URL, HTTP_AUTHORIZATION=header)
    assert answer.status_code == (200 if right else 401), repr(header[:80])
    with override_settings(KEYED_QUEUE_METRICS_TOKEN=None):
        assert client.get(URL, HTTP_AUTHORIZATION=header).status_code == 302
