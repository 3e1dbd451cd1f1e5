import { existsSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

/** sdk/typescript: the nearest directory up from here whose package.json is `forkvm`'s. */
function sdkRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    const manifest = join(dir, "package.json");
    if (existsSync(manifest) && (JSON.parse(readFileSync(manifest, "utf8")) as { name?: string }).name === "forkvm") {
      return dir;
    }
    const parent = dirname(dir);
    if (parent === dir) throw new Error("cannot find sdk/typescript/package.json");
    dir = parent;
  }
}

export const SDK_ROOT = sdkRoot();
export const REPO_ROOT = join(SDK_ROOT, "../..");
export const OPENAPI_PATH = join(REPO_ROOT, "docs/openapi.json");
