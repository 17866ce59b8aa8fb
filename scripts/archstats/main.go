// Command archstats prints the figures docs/architecture.md keeps about the tree's shape: lines per
// package (code and tests apart, generated files apart), the largest functions, and the import
// graph between the module's own packages. Run from the module root: go run ./scripts/archstats
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

const module = "github.com/t3code-mcp/t3code-mcp"

// generatedRE is Go's convention for a generated file (go help generate).
var generatedRE = regexp.MustCompile(`(?m)^// Code generated .* DO NOT EDIT\.$`)

type pkgLines struct {
	dir                  string
	code, tests, genCode int
	files                int
}

type function struct {
	name  string
	lines int
}

func main() {
	top := flag.Int("top", 20, "how many of the largest functions to list")
	flag.Parse()
	pkgs, funcs, err := measure(".")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	printLines(pkgs)
	printLargest(funcs, *top)
	if err := printImports(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// measure walks the tree below root: lines per package (code, tests, generated) and the length
// of every hand-written function outside tests.
func measure(root string) (map[string]*pkgLines, []function, error) {
	pkgs := map[string]*pkgLines{}
	var funcs []function
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "bin") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		n := bytes.Count(src, []byte("\n"))
		dir := filepath.Dir(path)
		p := pkgs[dir]
		if p == nil {
			p = &pkgLines{dir: dir}
			pkgs[dir] = p
		}
		p.files++
		switch {
		case generatedRE.Match(src):
			p.genCode += n
			return nil
		case strings.HasSuffix(path, "_test.go"):
			p.tests += n
			return nil
		}
		p.code += n
		f, err := parser.ParseFile(fset, path, src, 0)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			name := fn.Name.Name
			if fn.Recv != nil && len(fn.Recv.List) > 0 {
				name = recvName(fn.Recv.List[0].Type) + "." + name
			}
			lines := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1
			funcs = append(funcs, function{name: dir + " " + name, lines: lines})
		}
		return nil
	})
	return pkgs, funcs, err
}

func printLines(pkgs map[string]*pkgLines) {
	dirs := make([]string, 0, len(pkgs))
	for d := range pkgs {
		dirs = append(dirs, d)
	}
	sort.Strings(dirs)
	fmt.Println("## Lines per package (code / tests / generated)")
	fmt.Println()
	fmt.Println("| package | code | tests | generated |")
	fmt.Println("|---|---:|---:|---:|")
	var tc, tt, tg int
	for _, d := range dirs {
		p := pkgs[d]
		fmt.Printf("| `%s` | %d | %d | %d |\n", d, p.code, p.tests, p.genCode)
		tc, tt, tg = tc+p.code, tt+p.tests, tg+p.genCode
	}
	fmt.Printf("| total | %d | %d | %d |\n\n", tc, tt, tg)
}

func printLargest(funcs []function, top int) {
	sort.Slice(funcs, func(i, j int) bool {
		if funcs[i].lines != funcs[j].lines {
			return funcs[i].lines > funcs[j].lines
		}
		return funcs[i].name < funcs[j].name
	})
	over80 := 0
	for _, f := range funcs {
		if f.lines > 80 {
			over80++
		}
	}
	fmt.Printf("## Largest functions (hand-written, not tests; %d over 80 lines)\n\n", over80)
	fmt.Println("| function | lines |")
	fmt.Println("|---|---:|")
	for i, f := range funcs {
		if i == top {
			break
		}
		fmt.Printf("| `%s` | %d |\n", f.name, f.lines)
	}
	fmt.Println()
}

// printImports prints every package's imports of the module's own packages (go list).
func printImports() error {
	fmt.Println("## Import graph (the module's own packages; tests left out)")
	fmt.Println()
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "./...").Output()
	if err != nil {
		return fmt.Errorf("go list: %w", err)
	}
	fmt.Println("```")
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		var own []string
		for _, imp := range fields[1:] {
			if strings.HasPrefix(imp, module+"/") {
				own = append(own, short(imp))
			}
		}
		fmt.Printf("%s -> %s\n", short(fields[0]), strings.Join(own, " "))
	}
	fmt.Println("```")
	return nil
}

func short(importPath string) string {
	if importPath == module {
		return "."
	}
	return strings.TrimPrefix(importPath, module+"/")
}

func recvName(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return recvName(t.X)
	case *ast.IndexExpr:
		return recvName(t.X)
	case *ast.IndexListExpr:
		return recvName(t.X)
	case *ast.Ident:
		return t.Name
	}
	return "?"
}
