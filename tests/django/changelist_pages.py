"""The admin's keyed task list driven through Django's test client: a page's ids and cursor links."""

import html
import re

from django.urls import reverse


def url(query: str = "") -> str:
    return reverse("admin:keyed_queue_keyedtask_changelist") + query


def open_page(client, query: str = ""):
    """The ids shown (in order), the cursor links by name, and the response."""
    response = client.get(url(query))
    assert response.status_code == 200, (query, response.status_code, response.get("Location"))
    ids = [row.pk for row in response.context["cl"].result_list]
    found = re.findall(r'<a href="([^"]*)" id="cursor-(\w+)"', str(response.content, "utf-8"))
    links = {name: html.unescape(href) for href, name in found}
    return ids, links, response


def walk(client, query: str) -> tuple[list[list[int]], list[list[int]]]:
    """Every page going older from ``query``, then every page going newer from the last."""
    forward = []
    ids, links, _ = open_page(client, query)
    forward.append(ids)
    while "older" in links:
        ids, links, _ = open_page(client, links["older"])
        forward.append(ids)
    backward = [ids]
    while "newer" in links:
        ids, links, _ = open_page(client, links["newer"])
        backward.append(ids)
    return forward, backward[::-1]
