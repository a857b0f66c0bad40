package control

import (
	"errors"

	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// inFile places err, a command's failure on the file it read as data, in
// that file (shapes.InFile), a module file's refusal (ModuleFileError)
// among them.
func inFile(file string, data []byte, err error) error {
	var me *ModuleFileError
	if errors.As(err, &me) {
		return shapes.PlaceIn(file, data, me.Resource, me.Field, err)
	}
	return shapes.InFile(file, data, err)
}

// checkModuleFile refuses a module file whose text is at fault, placed
// in it (inFile): assign and assign --plan say so before they connect, as
// nothing the control side holds bears on it.
func checkModuleFile(file string, data []byte) error {
	if fe := shapes.CheckJSON(file, data); fe != nil {
		return fe
	}
	_, _, err := ReadModule(data)
	return inFile(file, data, err)
}
