"""Write the bundled sample corpus: src/streamrag/data/sample_changes.jsonl.

A small, made-up company knowledge base as a change stream: a few hundred short
documents in ten domains with event times over 2024, then updates, deletes, an
older version that arrives late, out-of-order arrivals and a few malformed
lines. Deterministic (seeded), so the committed file can be regenerated:

    python scripts/make_sample_corpus.py
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "src" / "streamrag" / "data" / "sample_changes.jsonl"

SERVICES = [
    "billing",
    "checkout",
    "search",
    "inventory",
    "notifications",
    "auth",
    "payments",
    "shipping",
    "reporting",
    "recommendations",
]
DATABASES = ["PostgreSQL", "Redis", "MariaDB"]
APPS = ["Slack", "Zoom", "the VPN client", "Outlook", "the expense app", "Jira"]
LAPTOPS = ["MacBook", "ThinkPad", "Dell XPS"]
COUNTRIES = ["Germany", "France", "Spain", "Japan", "Canada", "Brazil", "India", "Poland"]
PLANS = ["Starter", "Team", "Business", "Enterprise"]

TEMPLATES: dict[str, list[tuple[str, str]]] = {
    "ops": [
        (
            "Rotate the {db} password for {svc}",
            "To rotate the {db} database password used by the {svc} service, create the new credential "
            "in the secrets manager, deploy {svc} with both the old and the new secret, then revoke the "
            "old password once the connection pool has recycled. Never paste database passwords into chat.",
        ),
        (
            "Restart {svc} without downtime",
            "Restart the {svc} service one pod at a time with a rolling restart. Wait until each pod "
            "passes its readiness check before the next one goes down, and watch the error rate dashboard.",
        ),
        (
            "{svc} latency alert runbook",
            "When the p99 latency alert for {svc} fires, check recent deploys first, then the {db} "
            "slow query log and the connection pool saturation. Roll back the last deploy if latency "
            "rose right after it.",
        ),
        (
            "Scale {svc} for a traffic peak",
            "Before a planned traffic peak raise the minimum replica count of {svc}, warm the {db} "
            "cache and confirm the autoscaler limits. Scale back down the day after.",
        ),
    ],
    "it-support": [
        (
            "{app} keeps disconnecting",
            "If {app} keeps disconnecting on your {laptop}, switch from Wi-Fi to a wired connection, "
            "update the client to the latest version and restart it. For VPN drops, choose the nearest "
            "gateway and turn off battery saving for the network adapter.",
        ),
        (
            "Install {app} on a {laptop}",
            "Open the self-service portal on your {laptop}, search for {app} and click install. The "
            "portal installs the licensed version and configures single sign-on automatically.",
        ),
        (
            "Reset your password for {app}",
            "Use the password reset page with your work email. A reset link arrives within five "
            "minutes; {app} signs you out on all devices after the reset.",
        ),
    ],
    "security": [
        (
            "Report a phishing email",
            "Do not click links in a suspicious email. Use the Report Phishing button in Outlook; "
            "the security team reviews every report within one business day.",
        ),
        (
            "Multi-factor authentication for {app}",
            "Multi-factor authentication is mandatory for {app}. Register a hardware key or an "
            "authenticator app; SMS codes are not accepted for administrator accounts.",
        ),
        (
            "Access review for {svc} production",
            "Every quarter the owners of {svc} review who has production access. Access not "
            "confirmed within two weeks is removed automatically.",
        ),
    ],
    "billing": [
        (
            "Refund policy for the {plan} plan",
            "Customers on the {plan} plan can request a full refund within 30 days of purchase. "
            "After that, refunds are prorated to the unused months.",
        ),
        (
            "Change the payment method on the {plan} plan",
            "Account owners change the card or bank account under Settings, Billing. The new method "
            "is charged from the next invoice of the {plan} plan.",
        ),
        (
            "VAT on invoices in {country}",
            "Invoices for customers in {country} show VAT at the local rate unless a valid VAT "
            "number is stored on the account, in which case reverse charge applies.",
        ),
    ],
    "hr": [
        (
            "Parental leave in {country}",
            "Employees in {country} receive the statutory parental leave plus four extra paid weeks. "
            "Tell your manager and HR at least eight weeks before the leave starts.",
        ),
        (
            "Working remotely from {country}",
            "You may work from {country} for up to 30 days a year. Longer stays need approval from HR "
            "because of tax and insurance rules.",
        ),
    ],
    "engineering": [
        (
            "Code review guidelines for {svc}",
            "Changes to {svc} need one approving review from a code owner. Keep pull requests under "
            "400 lines and include a test for each behaviour change.",
        ),
        (
            "Database migrations for {svc} on {db}",
            "Migrations for {svc} on {db} must be backwards compatible: add columns first, deploy the "
            "code, and drop old columns only in a later release.",
        ),
        (
            "Feature flags in {svc}",
            "Ship risky changes to {svc} behind a feature flag, roll out to one percent of traffic, "
            "and remove the flag within two sprints after full rollout.",
        ),
    ],
    "product": [
        (
            "Roadmap for {svc} next quarter",
            "Next quarter the {svc} team focuses on reliability and on the most requested feature "
            "from {plan} customers. Dates are estimates until the planning review.",
        ),
        (
            "Release notes process for {svc}",
            "Every release of {svc} gets customer-facing notes written by the product manager and "
            "reviewed by support before publishing.",
        ),
    ],
    "legal": [
        (
            "Data processing agreement for {country}",
            "Customers in {country} can sign our standard data processing agreement online. Custom "
            "terms need review by legal and take about two weeks.",
        ),
        (
            "Open-source licenses in {svc}",
            "Dependencies of {svc} must use permissive licenses. Ask legal before adding a library "
            "under a copyleft license.",
        ),
    ],
    "sales": [
        (
            "Discount approval for the {plan} plan",
            "Sales reps may give up to 10 percent off the {plan} plan. Larger discounts need approval "
            "from the regional sales director.",
        ),
        (
            "Trial extension for {plan} prospects",
            "A {plan} trial can be extended once by 14 days when the prospect has an active "
            "evaluation plan and a named champion.",
        ),
    ],
    "facilities": [
        (
            "Booking meeting rooms in the {country} office",
            "Book rooms in the {country} office through the calendar. Rooms not checked in within "
            "ten minutes are released for others.",
        ),
        (
            "Lost badge in the {country} office",
            "Report a lost badge to reception in the {country} office. The old badge is deactivated "
            "at once and a new one is ready the next working day.",
        ),
    ],
}

FIELDS = {
    "svc": SERVICES,
    "db": DATABASES,
    "app": APPS,
    "laptop": LAPTOPS,
    "country": COUNTRIES,
    "plan": PLANS,
}


def _slug(text: str) -> str:
    return "-".join("".join(c if c.isalnum() else " " for c in text.lower()).split())


def _docs(rng: random.Random) -> list[dict[str, str]]:
    docs = []
    for domain, templates in TEMPLATES.items():
        for title_t, body_t in templates:
            names = [f for f in FIELDS if "{" + f + "}" in title_t + body_t]
            combos = [{}]
            for name in names:
                combos = [dict(c, **{name: v}) for c in combos for v in FIELDS[name]]
            rng.shuffle(combos)
            for values in combos[:20]:
                title = title_t.format(**values)
                docs.append(
                    {
                        "domain": domain,
                        "title": title,
                        "text": f"{title}\n\n{body_t.format(**values)}",
                    }
                )
    return docs


def main() -> None:
    rng = random.Random(20240601)
    start = datetime(2024, 1, 1, tzinfo=UTC)
    events = []
    seen: dict[str, dict[str, str]] = {}
    for doc in _docs(rng):
        doc_id = f"{doc['domain']}/{_slug(doc['title'])}"
        if doc_id in seen:
            continue
        seen[doc_id] = doc
        t = start + timedelta(minutes=rng.randrange(0, 300 * 24 * 60))
        events.append(
            (
                t,
                {
                    "doc_id": doc_id,
                    "op": "upsert",
                    "domain": doc["domain"],
                    "title": doc["title"],
                    "text": doc["text"],
                },
            )
        )
    ids = sorted(seen)
    # Updates: a later version with an extra sentence.
    for doc_id in rng.sample(ids, 40):
        base = max(t for t, e in events if e["doc_id"] == doc_id)
        doc = seen[doc_id]
        t = base + timedelta(days=rng.randrange(1, 40))
        text = (
            doc["text"] + " Updated: this procedure was reviewed and confirmed by the owning team."
        )
        events.append(
            (
                t,
                {
                    "doc_id": doc_id,
                    "op": "upsert",
                    "domain": doc["domain"],
                    "title": doc["title"],
                    "text": text,
                },
            )
        )
    # Deletes.
    for doc_id in rng.sample(ids, 15):
        base = max(t for t, e in events if e["doc_id"] == doc_id)
        events.append(
            (base + timedelta(days=rng.randrange(1, 30)), {"doc_id": doc_id, "op": "delete"})
        )
    events.sort(key=lambda te: te[0])
    # Arrival order: by event time with local disorder (up to a few positions).
    keyed = [(i + rng.uniform(0, 6), t, e) for i, (t, e) in enumerate(events)]
    keyed.sort(key=lambda x: x[0])
    lines = []
    for _, t, e in keyed:
        record = {
            "doc_id": e["doc_id"],
            "op": e["op"],
            "event_time": t.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        record.update({k: v for k, v in e.items() if k not in ("doc_id", "op")})
        lines.append(json.dumps(record))
    # One stale version that arrives last: older than the version already indexed.
    stale_id = rng.choice(
        sorted(set(ids) - {e["doc_id"] for _, e in events if e["op"] == "delete"})
    )
    lines.append(
        json.dumps(
            {
                "doc_id": stale_id,
                "op": "upsert",
                "event_time": "2023-06-01T00:00:00Z",
                "domain": seen[stale_id]["domain"],
                "title": "outdated",
                "text": "OUTDATED DRAFT that must never be served.",
            }
        )
    )
    # Malformed lines, each a different mistake.
    bad = [
        '{"doc_id": "ops/broken", "op": "upsert", "event_time": "2024-03-01T00:00:00Z", "text": ',
        '{"op": "upsert", "event_time": "2024-03-02T00:00:00Z", "text": "no document id"}',
        '{"doc_id": "hr/naive-time", "event_time": "2024-03-03 10:00", "text": "time without zone"}',
        '{"doc_id": "it-support/empty", "op": "upsert", "event_time": "2024-03-04T00:00:00Z"}',
        "this line is not JSON at all",
    ]
    for i, line in enumerate(bad):
        lines.insert(len(lines) * (i + 1) // (len(bad) + 1), line)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {len(lines)} lines ({len(seen)} documents) to {OUT}")


if __name__ == "__main__":
    main()
