"""What changes a campaign for everyone (humaneval.campaign), an admin's with logins: create, status, export, the
LLM judge; and the Export tab's tables. A rater's units, judgments and the results are the campaigns' own
(`Studio.campaigns`, humaneval.campaign.Campaigns), called directly."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Callable, Sequence

from personalize.schema import current_login
from personalize.catalog import CORE_METHODS
from personalize.data import TASKS
from personalize.humaneval import campaign_files, campaign_pool
from personalize.humaneval.campaign_schema import DEFAULT_ITEMS
from personalize.studio.service import Service


class CampaignDesk(Service):
    def create_campaign(self, name: str, data: str | Path, split: str = "dev", limit: int = DEFAULT_ITEMS,
                        methods: Sequence[str] = CORE_METHODS, sources: Sequence[str] | str = (), **settings) -> dict:
        """A campaign over the first `limit` queries of a LaMP split, for this build (campaign.create_from_lamp);
        `sources` (a list, or comma-separated) keeps people from those sources only; `settings`: CampaignConfig's
        fields (mode, raters_per_item, ...), whose defaults are its."""
        self.rt.need_admin("creating a campaign (it reads a folder of this machine)")
        if isinstance(sources, str):
            sources = [x.strip() for x in sources.split(",") if x.strip()]
        return campaign_pool.create_from_lamp(self.store, name, data, split, limit, self.cfg.artifacts,
                                              self.engine.artifacts_id, self.task.name, sources=tuple(sources),
                                              methods=tuple(methods), **settings)

    def set_campaign_status(self, name: str, status: str) -> None:
        self.rt.need_admin("closing or opening a campaign")
        self.rt.campaigns.set_status(name, status)

    def export_campaign(self, name: str, fmt: str = "jsonl") -> tuple[Path, Path, int]:
        """The campaign's judgments (JSONL or CSV) and summary JSON in the export folder."""
        self.rt.need_admin("exporting a campaign's judgments (every rater's)")
        if fmt not in ("jsonl", "csv"):
            raise ValueError("export format is jsonl or csv")
        safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name.strip()) or "campaign"
        path = self.cfg.exports / f"campaign-{safe}.{fmt}"
        return campaign_files.export_judgments(self.rt.campaigns, name, path)

    def judge_campaign(self, name: str, model: str | None = None,
                       progress: Callable[[int, int, str], None] | None = None) -> dict:
        """The LLM judge (campaign.run_judge) on every unit; the judge model is loaded once and kept."""
        from personalize.humaneval.judge import Judge, JudgeConfig

        self.rt.need_admin("the LLM judge (it loads a model)")
        if model not in self.rt.judges:
            self.rt.judges[model] = Judge(JudgeConfig(model=model))
        campaign_pool.run_judge(self.rt.campaigns, name, self.rt.judges[model], progress, self.model_lock)
        return self.rt.campaigns.results(name)

    def export_table(self, table: str, fmt: str) -> tuple[Path, int]:
        """Export: a table (votes, generations) as JSONL or CSV in a new time-stamped folder under the exports."""
        from personalize.humaneval.table_export import export_table

        return export_table(self.store, table, fmt, self._export_folder())

    def export_predictions(self, method: str) -> Path:
        """Export: `method`'s generations as LaMP predictions for the task served."""
        from personalize.humaneval.table_export import export_predictions

        return export_predictions(self.store, TASKS[self.task.name].lamp_name, method, self._export_folder())

    def _export_folder(self) -> Path:
        """A new folder per export, under the login's own folder when there are logins (two logins exporting in
        the same second never write over each other's file)."""
        login = current_login() if self.cfg.logins else None
        mine = self.cfg.exports / (re.sub(r"[^\w.-]", "_", login) if login else "")
        return mine / time.strftime("%Y%m%d-%H%M%S")
