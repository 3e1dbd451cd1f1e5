/**
 * Run a TypeScript example from the repository's examples/ directory as a
 * user of the package would: compiled to JavaScript, with `import … from
 * "forkvm"` resolved to this package (its build in dist/).
 *
 *   node build/test/example.js quickstart
 */
import { spawn } from "node:child_process";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import ts from "typescript";
import { REPO_ROOT, SDK_ROOT } from "./paths.js";

/**
 * Compile examples/<name>.ts into build/examples/<name>.mjs. Inside this
 * package's directory, Node resolves `forkvm` to the package itself.
 */
export function compileExample(name: string): string {
  const source = readFileSync(join(REPO_ROOT, "examples", `${name}.ts`), "utf8");
  const { outputText, diagnostics } = ts.transpileModule(source, {
    compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022 },
    reportDiagnostics: true,
    fileName: `${name}.ts`,
  });
  if (diagnostics?.length) {
    throw new Error(ts.formatDiagnostics(diagnostics, ts.createCompilerHost({})));
  }
  const dir = join(SDK_ROOT, "build/examples");
  mkdirSync(dir, { recursive: true });
  const out = join(dir, `${name}.mjs`);
  writeFileSync(out, outputText);
  return out;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const name = process.argv[2] ?? "quickstart";
  const child = spawn(process.execPath, [compileExample(name)], { stdio: "inherit" });
  child.on("exit", (code, signal) => (process.exitCode = code ?? (signal ? 1 : 0)));
}
