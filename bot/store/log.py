"""The clusters' change logs (every run's freeze records its cluster's) and the audit log of who did what."""

from __future__ import annotations

from bot.store.base import Tables, now, redacted
from bot.store.rows import AuditEntry, Change


class LogTables(Tables):
    def add_change(self, cluster: str, what: str, by: str, via: str) -> Change:
        row = redacted({"cluster": cluster, "at": now(), "what": what, "by": by, "via": via})
        sql = "INSERT INTO changes (cluster, at, what, by, via) VALUES (:cluster, :at, :what, :by, :via) RETURNING id"
        with self.db.conn:
            (change_id,) = self.db.execute(sql, row).fetchone()
        return Change(id=change_id, **row)

    def changes(self, cluster: str, limit: int = 50) -> list[Change]:
        """The latest `limit` changes of a cluster, oldest first."""
        rows = self.db.table("changes").rows_where("cluster = ?", [cluster], order_by="id DESC", limit=limit)
        return [Change(**row) for row in reversed(list(rows))]

    def audit(self, actor: str, action: str, target: str, detail: str = "", via: str = "cli", place: str = "") -> None:
        """`place`: where the action was asked for (a Slack channel id; empty for the terminal)."""
        row = redacted({"at": now(), "actor": actor, "action": action, "target": target, "detail": detail, "via": via})
        with self.db.conn:
            self.db.table("audit_log").insert({**row, "place": place})

    def audit_entries(self, limit: int = 50) -> list[AuditEntry]:
        """The latest entries, newest first."""
        return [AuditEntry(**row) for row in self.db.table("audit_log").rows_where(order_by="id DESC", limit=limit)]
