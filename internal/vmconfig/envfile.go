package vmconfig

import (
	"fmt"
	"strings"
)

// ParseEnvFile reads an env file as the shell's `set -a; . FILE` would set its variables,
// for the subset of the shell such files use: `KEY=VALUE` or `export KEY=VALUE` statements,
// one a line, with '…' and "…" quoting (a quoted value may span lines), backslash escapes,
// blank lines and # comments. Anything the shell would run or expand ($VAR, `cmd`, ;, |, a
// command after the assignment) is an error rather than a guess.
func ParseEnvFile(text string) ([][2]string, error) {
	p := &envParser{s: text, line: 1}
	var out [][2]string
	for {
		p.skipBlank()
		if p.eof() {
			return out, nil
		}
		kv, err := p.assignment()
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", p.line, err)
		}
		out = append(out, kv)
	}
}

type envParser struct {
	s    string
	i    int
	line int
}

func (p *envParser) eof() bool  { return p.i >= len(p.s) }
func (p *envParser) peek() byte { return p.s[p.i] }

func (p *envParser) next() byte {
	c := p.s[p.i]
	p.i++
	if c == '\n' {
		p.line++
	}
	return c
}

// skipBlank skips white space, newlines and comments between statements.
func (p *envParser) skipBlank() {
	for !p.eof() {
		switch c := p.peek(); {
		case c == ' ' || c == '\t' || c == '\r' || c == '\n':
			p.next()
		case c == '#':
			p.skipComment()
		default:
			return
		}
	}
}

func (p *envParser) skipComment() {
	for !p.eof() && p.peek() != '\n' {
		p.next()
	}
}

func (p *envParser) assignment() ([2]string, error) {
	if strings.HasPrefix(p.s[p.i:], "export ") || strings.HasPrefix(p.s[p.i:], "export\t") {
		p.i += len("export")
		for !p.eof() && (p.peek() == ' ' || p.peek() == '\t') {
			p.next()
		}
	}
	start := p.i
	for !p.eof() && isNameByte(p.peek(), p.i == start) {
		p.next()
	}
	name := p.s[start:p.i]
	if name == "" || p.eof() || p.peek() != '=' {
		return [2]string{}, fmt.Errorf("want KEY=VALUE, got %q", firstLine(p.s[start:]))
	}
	p.next() // '='
	value, err := p.value()
	if err != nil {
		return [2]string{}, fmt.Errorf("%s: %w", name, err)
	}
	// Only blanks, a comment or another assignment may follow on the line.
	for !p.eof() && (p.peek() == ' ' || p.peek() == '\t') {
		p.next()
	}
	if !p.eof() && p.peek() == '#' {
		p.skipComment()
	}
	if !p.eof() && p.peek() != '\n' && !p.atAssignment() {
		return [2]string{}, fmt.Errorf("%s: unexpected %q after the value (the shell would run it)", name, firstLine(p.s[p.i:]))
	}
	return [2]string{name, value}, nil
}

// atAssignment reports whether NAME= starts here.
func (p *envParser) atAssignment() bool {
	j := p.i
	for j < len(p.s) && isNameByte(p.s[j], j == p.i) {
		j++
	}
	return j > p.i && j < len(p.s) && p.s[j] == '='
}

// value reads a word: unquoted, '…' and "…" parts up to an unquoted blank or newline.
func (p *envParser) value() (string, error) {
	var b strings.Builder
	for !p.eof() {
		c := p.peek()
		switch {
		case c == ' ' || c == '\t' || c == '\n':
			return b.String(), nil
		case c == '\r':
			return "", fmt.Errorf("carriage return (CRLF line ends): the shell would keep it in the value")
		case c == '\'':
			p.next()
			end := strings.IndexByte(p.s[p.i:], '\'')
			if end < 0 {
				return "", fmt.Errorf("unterminated '")
			}
			for range end {
				b.WriteByte(p.next())
			}
			p.next()
		case c == '"':
			p.next()
			if err := p.doubleQuoted(&b); err != nil {
				return "", err
			}
		case c == '\\':
			p.next()
			if p.eof() {
				return b.String(), nil
			}
			if e := p.next(); e != '\n' { // backslash-newline continues the line
				b.WriteByte(e)
			}
		case strings.IndexByte("$`;&|<>()", c) >= 0:
			return "", fmt.Errorf("unsupported shell syntax %q", string(c))
		default:
			b.WriteByte(p.next())
		}
	}
	return b.String(), nil
}

func (p *envParser) doubleQuoted(b *strings.Builder) error {
	for !p.eof() {
		switch c := p.next(); c {
		case '"':
			return nil
		case '$', '`':
			return fmt.Errorf("unsupported shell expansion %q in \"…\"", string(c))
		case '\\':
			if p.eof() {
				return fmt.Errorf("unterminated \"")
			}
			switch e := p.next(); e {
			case '"', '\\', '$', '`':
				b.WriteByte(e)
			case '\n': // continuation
			default:
				b.WriteByte('\\')
				b.WriteByte(e)
			}
		default:
			b.WriteByte(c)
		}
	}
	return fmt.Errorf("unterminated \"")
}

func isNameByte(c byte, first bool) bool {
	return c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || !first && '0' <= c && c <= '9'
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
