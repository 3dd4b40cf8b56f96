"""Seed/refresh the Simplified Chinese catalog from this table (run by `make i18n-update`; edit the .po freely)."""
from __future__ import annotations

import sys
from pathlib import Path

from babel.messages.pofile import read_po, write_po

ZH = {
    '**Last outcome**: {last}': '**最近结果**：{last}',
    '**Outcome**: {outcome}': '**结果**：{outcome}',
    '**Scheduled for**: {time}': '**计划时间**：{time}',
    '**Since**: {since}': '**开始于**：{since}',
    '- {name}: {status} (created by {creator})': '- {name}：{status}（创建者 {creator}）',
    'Failing': '失败中',
    'Pause schedule': '暂停定时任务',
    'Recheck': '重新检查',
    'Recovered': '已恢复',
    'Recovering': '恢复中',
    'Reminder: this incident is still unacknowledged.': '提醒：此告警尚未确认。',
    'Scheduled task alert: {name}': '定时任务告警：{name}',
    'Scheduled task finished: {name}': '定时任务已结束：{name}',
    'Snoozed until {until}.': '已暂缓提醒，直到 {until}。',
    'Withdrawn': '已撤回',
    'unknown': '未知',
    '{count} scheduled task alerts': '{count} 条定时任务告警',
    '…and {count} more': '……还有 {count} 条',
    "**Active incidents** (administrator): {count}": "**活跃告警**（管理员）：{count}",
    "**Created by**: {creator}": "**创建者**：{creator}",
    "**Delivery**: {state}": "**投递状态**：{state}",
    "**Failures** {failures} · **Missed runs** {missed} · **Unknown** {unknowns}": "**失败** {failures} · **错过** {missed} · **未知** {unknowns}",
    "**Last outcomes**": "**最近结果**",
    "**Latest outcomes**": "**最新结果**",
    "**Next run**: {time}": "**下次运行**：{time}",
    "**Rule**: {rule} ({tz})": "**规则**：{rule}（{tz}）",
    "**Status**: {status}": "**状态**：{status}",
    "**Your schedules**: {total} · **failing**: {failing} · **paused**: {paused}": "**你的定时任务**：{total} · **失败中**：{failing} · **已暂停**：{paused}",
    "Acknowledge": "确认",
    "Acknowledged": "已确认",
    "Acknowledged — no more reminders.": "已确认，不再提醒。",
    "Alert center": "告警中心",
    "All schedules": "全部定时任务",
    "Back to overview": "返回概览",
    "Delete": "删除",
    "Delivery rechecked": "已重新检查投递",
    "Hello {name}.": "你好，{name}。",
    "History": "历史",
    "Newer run": "较新一次",
    "Next": "下一页",
    "Next part": "下一部分",
    "No active incidents.": "没有活跃的告警。",
    "No outcomes yet.": "还没有运行结果。",
    "No results yet: no run of this schedule has a Task result.": "还没有结果：此定时任务的运行都没有任务结果。",
    "No runs yet.": "还没有运行。",
    "Older run": "较早一次",
    "Only this application's administrator can use the alert center.": "只有此应用的管理员可以使用告警中心。",
    "Open": "打开",
    "Page {page}": "第 {page} 页",
    "Page {page} of {pages} · {total} schedules": "第 {page} / {pages} 页 · 共 {total} 个定时任务",
    "Part {part} of {parts}": "第 {part} / {parts} 部分",
    "Pause": "暂停",
    "Paused: no new runs until you resume.": "已暂停：恢复前不会有新的运行。",
    "Personal schedules": "个人定时任务",
    "Previous": "上一页",
    "Previous part": "上一部分",
    "Recheck delivery": "重新检查投递",
    "Results": "结果",
    "Resume": "恢复",
    "Resumed.": "已恢复。",
    "Schedule": "定时任务",
    "Schedule deleted": "定时任务已删除",
    "Schedule paused": "定时任务已暂停",
    "Schedule resumed": "定时任务已恢复",
    "Schedule {name} is deleted; its history stays.": "定时任务 {name} 已删除；历史记录保留。",
    "Snooze 24 h": "暂缓 24 小时",
    "Snoozed for 24 hours": "已暂缓 24 小时",
    "Snoozed until {time}.": "已暂缓提醒，直到 {time}。",
    "This button is out of date; send /amux for a fresh card.": "此按钮已过期；发送 /amux 获取新卡片。",
    "This incident does not exist in this application.": "此告警在本应用中不存在。",
    "This schedule does not exist or is not yours.": "此定时任务不存在或不是你的。",
    "Working on it…": "正在处理…",
    "You have no schedules. Ask the agent in a chat to create one.": "你还没有定时任务。可以在聊天中让智能体创建一个。",
    "Your Feishu identity is not bound to amux.": "你的飞书身份未绑定到 amux。",
    "active": "运行中",
    "amux overview": "amux 概览",
    "cancelled": "已取消",
    "failed": "失败",
    "failing": "失败中",
    "missed": "错过",
    "next run {time}": "下次运行 {time}",
    "no runs yet": "尚未运行",
    "not admitted": "未被接纳",
    "paused": "已暂停",
    "recovered": "已恢复",
    "recovering": "恢复中",
    "running": "运行中",
    "skipped": "已跳过",
    "succeeded": "成功",
    "timed out": "超时",
    "unknown (not observed)": "未知（未观察到）",
    "withdrawn": "已撤回",
}


def fill(po_path: Path) -> list[str]:
    """Fill empty translations from ZH; return msgids still untranslated."""
    with po_path.open("rb") as f:
        cat = read_po(f, locale="zh_Hans")
    missing = []
    for m in cat:
        if not m.id:
            continue
        if (not m.string or m.fuzzy) and m.id in ZH:  # a fuzzy guess is not a translation
            m.string = ZH[m.id]
            m.flags.discard("fuzzy")
        if not m.string:
            missing.append(m.id)
    with po_path.open("wb") as f:
        write_po(f, cat, width=0, omit_header=False)
    return missing


if __name__ == "__main__":
    left = fill(Path(sys.argv[1] if len(sys.argv) > 1 else "locales/zh_Hans/LC_MESSAGES/messages.po"))
    if left:
        print("untranslated:", *left, sep="\n  ")
