"""Scrapes Myelin's metrics listener after the client tests and parses the page with the
Prometheus Python client's OpenMetrics parser (a real Prometheus parser, stricter than the
text one: it needs `# EOF`, counters ending in `_total`, well-formed histograms). Checks that
the counters the clients moved have moved and that no label carries an ID.

Usage: metrics_check.py http://127.0.0.1:PORT/metrics
"""

import sys
import urllib.request

from prometheus_client.openmetrics.parser import text_string_to_metric_families


def main(url):
    with urllib.request.urlopen(url, timeout=10) as response:
        content_type = response.headers["Content-Type"]
        text = response.read().decode()
    assert content_type.startswith("application/openmetrics-text"), content_type
    families = {f.name: f for f in text_string_to_metric_families(text)}

    def total(name, **labels):
        family = families[name]
        return sum(
            s.value
            for s in family.samples
            if s.name == name + "_total"
            and all(s.labels.get(k) == v for k, v in labels.items())
        )

    for name in [
        "myelin_http_requests",
        "myelin_send_requests",
        "myelin_sync_requests",
        "myelin_sync_build_seconds",
        "myelin_db_pool_wait_seconds",
        "myelin_db_query_seconds",
        "myelin_events_persisted",
        "myelin_delivery_commit_seconds",
        "myelin_delivery_wake_seconds",
        "myelin_delivery_respond_seconds",
        "myelin_stream_position",
        "process_cpu_seconds",
        "process_resident_memory_bytes",
        "process_open_fds",
    ]:
        assert name in families, f"{name} missing"
    assert families["myelin_sync_build_seconds"].type == "histogram"
    assert families["myelin_db_query_seconds"].type == "histogram"
    assert families["myelin_delivery_commit_seconds"].type == "histogram"
    assert total("myelin_send_requests", outcome="created") > 0, "no send counted"
    assert total("myelin_events_persisted", origin="client") > 0, "no event counted"
    assert total("myelin_sync_requests") > 0, "no sync counted"
    assert total("myelin_http_requests") > 0, "no request counted"
    for family in families.values():
        for sample in family.samples:
            for key, value in sample.labels.items():
                assert not any(c in value for c in "@!$:"), f"{sample}: {key} leaks an ID"
    print(f"metrics: {len(families)} families parsed, counters moved")


if __name__ == "__main__":
    main(sys.argv[1])
