// Regenerate src/gen/ from ../../proto and google/rpc/error_details.proto.
//
//   npm run generate                 writes src/gen/ here
//   node scripts/generate.mjs DIR    writes DIR/src/gen/ (the staleness test)
//
// buf and protoc-gen-es come from node_modules (`npm ci`), at the versions
// package-lock.json pins. google/rpc/error_details.proto (ErrorInfo, RetryInfo,
// BadRequest, PreconditionFailure) comes from the google-proto-files package.
import { execFileSync } from "node:child_process";
import { cpSync, mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const out = resolve(process.argv[2] ?? here);
const bin = join(here, "node_modules", ".bin");
const env = { ...process.env, PATH: `${bin}:${process.env.PATH}` };
const google = mkdtempSync(join(tmpdir(), "lethe-google-"));
try {
  mkdirSync(join(google, "google", "rpc"), { recursive: true });
  cpSync(
    join(here, "node_modules", "google-proto-files", "google", "rpc", "error_details.proto"),
    join(google, "google", "rpc", "error_details.proto"),
  );
  rmSync(join(out, "src", "gen"), { recursive: true, force: true });
  for (const input of [resolve(here, "..", "..", "proto"), google]) {
    execFileSync(
      join(bin, "buf"),
      ["generate", input, "--template", join(here, "buf.gen.yaml"), "-o", out],
      { cwd: here, env, stdio: "inherit" },
    );
  }
} finally {
  rmSync(google, { recursive: true, force: true });
}
console.log(`wrote ${join(out, "src", "gen")}`);
