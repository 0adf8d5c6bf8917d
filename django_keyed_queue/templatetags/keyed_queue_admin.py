from ..ops.console.breadcrumbs import register as register
