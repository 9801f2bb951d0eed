#!/usr/bin/env bash
# Nightly data backup of one Lethe store that honours the keystore contract:
# it runs `lethe backup`, which copies only the data environment (ciphertext
# and non-content metadata, compacted, consistent while the server runs) and
# a manifest — never the keystore (DATA/keystore) and never the KEK. Then it
# keeps the newest $LETHE_BACKUP_KEEP backups and deletes the older ones.
#
# A data backup is restorable only beside the live keystore and KEK
# (`lethe restore --backup DIR --data DATA`, server stopped): records whose
# keys were destroyed after the backup stay unreadable and are forgotten at
# the next start. That is the point — a backup cannot overrule a deletion — so
# do not "complete" it by copying the keystore or the KEK next to it.
#
# Settings (environment; defaults match deploy/systemd/lethe.service):
#   LETHE_BIN          the lethe command            /opt/lethe/venv/bin/lethe
#   LETHE_DATA         the data directory           /var/lib/lethe/data
#   LETHE_KEK_FILE     the KEK file (checked to lie outside the backups, never copied)
#                                                   /var/lib/lethe-kek/lethe.kek
#   LETHE_BACKUP_ROOT  where dated backups go       /var/backups/lethe
#   LETHE_BACKUP_KEEP  how many to keep             14
# Run it as the service user (see lethe-backup.cron). Exit status: that of
# `lethe backup` (2: configuration, 1: failure), 0 when the backup is written.
set -euo pipefail
umask 077

LETHE_BIN=${LETHE_BIN:-/opt/lethe/venv/bin/lethe}
LETHE_DATA=${LETHE_DATA:-/var/lib/lethe/data}
LETHE_KEK_FILE=${LETHE_KEK_FILE:-/var/lib/lethe-kek/lethe.kek}
LETHE_BACKUP_ROOT=${LETHE_BACKUP_ROOT:-/var/backups/lethe}
LETHE_BACKUP_KEEP=${LETHE_BACKUP_KEEP:-14}

case "$LETHE_BACKUP_KEEP" in
    '' | *[!0-9]* | 0) echo "lethe-backup: LETHE_BACKUP_KEEP must be a positive integer" >&2; exit 2 ;;
esac
data=$(realpath -m "$LETHE_DATA")
root=$(realpath -m "$LETHE_BACKUP_ROOT")
kek_dir=$(dirname "$(realpath -m "$LETHE_KEK_FILE")")
case "$root/" in
    "$data"/*) echo "lethe-backup: $LETHE_BACKUP_ROOT lies inside the data directory $LETHE_DATA" >&2; exit 2 ;;
    "$kek_dir"/*) echo "lethe-backup: $LETHE_BACKUP_ROOT lies inside the KEK's directory $kek_dir" >&2; exit 2 ;;
esac

mkdir -p "$root"
stamp=$(date -u +%Y%m%dT%H%M%SZ)
out="$root/lethe-$stamp"
"$LETHE_BIN" backup --data "$LETHE_DATA" --kek-file "$LETHE_KEK_FILE" --out "$out"

# Keep the newest $LETHE_BACKUP_KEEP (names sort by time); only our own names.
mapfile -t old < <(find "$root" -mindepth 1 -maxdepth 1 -type d -name 'lethe-????????T??????Z' \
    | sort -r | tail -n "+$((LETHE_BACKUP_KEEP + 1))")
for dir in "${old[@]}"; do
    rm -rf -- "$dir"
done
echo "lethe-backup: wrote $out; kept the newest $LETHE_BACKUP_KEEP, removed ${#old[@]}"
